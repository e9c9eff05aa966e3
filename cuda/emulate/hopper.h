//   pytest tests/test_hopper.py   (held against separate encodings of the PTX ISA's definitions)
// Hopper's asynchronous instructions on the CPU: wgmma (warpgroup MMA on shared-memory operands
// named by matrix descriptors), TMA (cp.async.bulk.tensor, a tile of a tensor copied by the copy
// engine) and mbarrier (the barrier in shared memory that counts arrivals and bytes). Included by
// cuda_emu.h; the kernels reach these through cuda/kernels/instructions.cuh (inline PTX on sm_90a).
//
// The model, and why each part is there:
// - The shared window. A descriptor names shared memory by its 18-bit address in the block's
//   window. A Hopper kernel declares its shared memory as one arena, 1024-byte aligned, and
//   announces it first (shared_window): descriptor addresses are offsets into it, and since the
//   arena is aligned, an offset's low bits are the host address's, which the swizzles read.
// - wgmma: the warpgroup's 128 threads issue it together (checked: the same descriptors); each
//   thread's part of the result (D's fragment table, the PTX ISA's "Register Fragments" for
//   m64nNk16) is computed at the wgmma.wait_group that completes its group, reading A and B from
//   shared memory then, as the tensor cores read them asynchronously. Until then the thread's
//   accumulator registers hold a poison NaN (0x7FA00BAD, signalling): a thread that ends with a
//   group in flight is reported, and so is a write to them in flight (at the wait), and a read of
//   them that reaches arithmetic, a comparison or a conversion (a floating-point trap, x86-64).
//   A read that only copies the bits (a move, a store, the integer rounding to bfloat16) cannot be
//   seen on a CPU without instrumenting every load: it is not reported, and leaves NaN where the
//   value lands. wgmma.fence is required before a thread's first wgmma and after other
//   instructions wrote its accumulators (writes only: reads leave no trace).
// - The async proxy: a wgmma reading shared memory that the kernel's own stores wrote, with no
//   fence.proxy.async by the writer (ordered before the read by a __syncthreads), is reported with
//   the offset, the writer and the wgmma's code address; so is a TMA copy completing on an
//   mbarrier whose mbarrier.init no fence.mbarrier_init made visible. (Stores are attributed to a
//   thread with fibers only: hopper_checks.h says how, and what it does not see.)
// - setmaxnreg moves registers between warpgroups within the block's pool (ptxas's registers a
//   thread at launch × threads); an increase the pool cannot meet is reported as the hang it is.
// - TMA: a copy in flight fills its box's bytes in shared memory with 0xFF (NaN in every float
//   type) at issue; the bytes land, with the tensor map's swizzle and zeros outside the tensor,
//   when a thread waits on its mbarrier, and then complete the barrier's transaction bytes. A wgmma
//   that reads bytes still in flight is reported, naming the copy.
// - mbarrier: phases, an arrival count and transaction bytes, as the PTX ISA defines them. A thread
//   that waits on a phase that cannot complete (a wrong expect_tx byte count, an arrival that
//   never comes) hangs on a GPU; here the block stops, and the report names each barrier, its
//   phase, the arrivals and bytes it still waits for, and how many threads wait on it. Bytes beyond
//   what expect_tx announced are reported too.
// With -DCUDA_EMU_PLANT_FRAGMENT=3 (D's table) or 4 (the swizzle) a definition is deliberately
// wrong, to show that tests/test_hopper.py catches it.
// - With OS threads (ThreadSanitizer), the state is guarded by one mutex, so that a correct
//   protocol gives the happens-before edges the hardware's barriers give, and a broken one (a
//   consumer reading a stage before its phase, a producer overwriting a stage still being read)
//   is a data race the sanitizer reports.
#pragma once

#include <chrono>
#include <cstdarg>
#include <map>

#include "trace.h"  // the optional event trace (off by default)

namespace emu {

// One line on stderr, "cuda_emu: " first: every report of a broken protocol.
inline void report_line(const char* fmt, std::va_list args) {
  std::fputs("cuda_emu: ", stderr);
  std::vfprintf(stderr, fmt, args);
  std::fputc('\n', stderr);
}
inline void protocol_error_report(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void protocol_error_report(const char* fmt, ...) {
  std::va_list args;
  va_start(args, fmt);
  report_line(fmt, args);
  va_end(args);
  report_protocol_error();
}
}  // namespace emu

#include "hopper_checks.h"  // the async proxy, wgmma.fence, accumulators in flight, setmaxnreg's pool

namespace emu {

// ---------------------------------------------------------------------------------------------
// Swizzles and matrix descriptors (PTX ISA: "Matrix Descriptor Format", "Shared Memory Matrix
// Layout"). Addresses are byte offsets in the shared window.
// ---------------------------------------------------------------------------------------------
enum Swizzle : int { kSwizzleNone = 0, kSwizzle128 = 1, kSwizzle64 = 2, kSwizzle32 = 3 };  // descriptor bits 62-63

inline int swizzle_bytes(int mode) { return mode == kSwizzle128 ? 128 : mode == kSwizzle64 ? 64 : mode == kSwizzle32 ? 32 : 0; }
// The 16-byte chunk bits [4, 4+b) of an address XORed with bits [7, 7+b): b = 3, 2, 1 for the
// 128-, 64-, 32-byte swizzles. (So, for 128 bytes, chunk c of the row at 128·r is stored at chunk
// c ^ (r % 8) of that row.)
inline uint32_t swizzled(uint32_t addr, int mode) {
  const uint32_t bits = mode == kSwizzle128 ? 7u : mode == kSwizzle64 ? 3u : mode == kSwizzle32 ? 1u : 0u;
#if CUDA_EMU_PLANT_FRAGMENT == 4
  return addr ^ (((addr >> 6) & bits) << 4);  // planted: the row bits read one place too low
#else
  return addr ^ (((addr >> 7) & bits) << 4);
#endif
}

struct Descriptor {
  uint32_t start, lbo, sbo;  // bytes
  int base_offset, mode;
};
inline Descriptor decode_descriptor(uint64_t d) {
  return {uint32_t(d & 0x3fffu) << 4, uint32_t((d >> 16) & 0x3fffu) << 4, uint32_t((d >> 32) & 0x3fffu) << 4,
          int((d >> 49) & 7u), int((d >> 62) & 3u)};
}
inline uint64_t encode_descriptor(uint32_t start, uint32_t lbo, uint32_t sbo, int mode) {
  return uint64_t((start & 0x3ffffu) >> 4) | (uint64_t((lbo & 0x3ffffu) >> 4) << 16) |
         (uint64_t((sbo & 0x3ffffu) >> 4) << 32) | (uint64_t(mode & 3) << 62);
}

// The window address of element (mn, k) of a wgmma operand (A: mn = m; B: mn = n), E bytes an
// element, in the canonical layouts: K-major (k contiguous) or MN-major (mn contiguous), with a
// swizzle atom of 8 rows of S = swizzle_bytes(mode) bytes (or, without swizzle, core matrices of
// 8 rows of 16 bytes).
//   K-major, swizzled:    start + (mn / 8)·SBO + (mn % 8)·S + k·E
//   K-major, no swizzle:  start + (mn / 8)·SBO + (k / (16/E))·LBO + (mn % 8)·16 + (k % (16/E))·E
//   MN-major, swizzled:   start + (mn / (S/E))·LBO + (k / 8)·SBO + (k % 8)·S + (mn % (S/E))·E
// then swizzled. (MN-major without swizzle is not modelled: the kernels do not use it.)
inline bool operand_address(const Descriptor& d, bool mn_major, int mn, int k, int E, uint32_t& addr) {
  const int S = swizzle_bytes(d.mode);
  if (d.base_offset != 0) return false;
  if (!mn_major && S) addr = d.start + (mn / 8) * d.sbo + (mn % 8) * S + k * E;
  else if (!mn_major) addr = d.start + (mn / 8) * d.sbo + (k / (16 / E)) * d.lbo + (mn % 8) * 16 + (k % (16 / E)) * E;
  else if (S) addr = d.start + (mn / (S / E)) * d.lbo + (k / 8) * d.sbo + (k % 8) * S + (mn % (S / E)) * E;
  else return false;
  addr = swizzled(addr, d.mode);
  return true;
}

// wgmma's accumulator D (m64nN, float32): N/2 registers a thread. Warp w of the warpgroup holds
// rows 16w to 16w+15, in mma.m16n8's C layout repeated every 8 columns (PTX ISA, "Register
// Fragments" for wgmma m64nNk16, matrix D).
inline RowCol frag_wgmma_d(int thread, int i) {
  const int w = thread / 32, lane = thread % 32, g = lane / 4, t = lane % 4;
#if CUDA_EMU_PLANT_FRAGMENT == 3
  return {16 * w + g + 8 * (i & 1), 8 * (i / 4) + 2 * t + ((i >> 1) & 1)};  // planted: the two halves swapped
#else
  return {16 * w + g + 8 * ((i >> 1) & 1), 8 * (i / 4) + 2 * t + (i & 1)};
#endif
}

// ---------------------------------------------------------------------------------------------
// TMA: the tensor map (the model's own fields in CUtensorMap's 128 opaque bytes) and its encoding,
// with the CUDA driver API's rules for cuTensorMapEncodeTiled that the kernels rely on.
// ---------------------------------------------------------------------------------------------
struct TensorMapModel {
  uint32_t magic;
  uint32_t elem_bytes, rank, swizzle;  // swizzle: kSwizzle* mode
  const unsigned char* base;
  uint64_t dim[2], stride[2];  // stride[0]: bytes between consecutive indices of dim 1
  uint32_t box[2];
};
constexpr uint32_t kTensorMapMagic = 0x544d4150;  // "TMAP"
static_assert(sizeof(TensorMapModel) <= 128, "CUtensorMap holds 128 bytes");

// 0, or 1 with the rule broken on stderr: rank 2; 16-byte-aligned base and row stride; box sides
// of 1 to 256 elements; with a swizzle, an inner box side of at most the swizzle's bytes.
inline int tensor_map_encode_2d(void* map, uint32_t elem_bytes, const void* base, uint64_t dim0, uint64_t dim1,
                                uint64_t row_stride_bytes, uint32_t box0, uint32_t box1, int mode) {
  const char* why = nullptr;
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) why = "the base address is not 16-byte aligned";
  else if (row_stride_bytes % 16 != 0) why = "the row stride is not a multiple of 16 bytes";
  else if (box0 == 0 || box1 == 0 || box0 > 256 || box1 > 256) why = "a box side is outside 1 to 256";
  else if (swizzle_bytes(mode) && box0 * elem_bytes > uint32_t(swizzle_bytes(mode)))
    why = "the box's inner side is wider than the swizzle";
  else if ((box0 * elem_bytes) % 16 != 0) why = "the box's inner side is not a multiple of 16 bytes";
  if (why) {
    std::fprintf(stderr, "cuda_emu: cuTensorMapEncodeTiled: %s\n", why);
    return 1;
  }
  TensorMapModel m{kTensorMapMagic, elem_bytes, 2, uint32_t(mode), static_cast<const unsigned char*>(base),
                   {dim0, dim1}, {row_stride_bytes, 0}, {box0, box1}};
  std::memset(map, 0, 128);
  std::memcpy(map, &m, sizeof(m));
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The state of a launch's running block.
// ---------------------------------------------------------------------------------------------
struct MBarrier {
  unsigned count = 0, pending = 0, phase = 0;  // phase: how many have completed
  int64_t tx = 0;                              // bytes announced (expect_tx) and not yet delivered
  std::vector<unsigned> waiting;               // fibers
  std::condition_variable changed;             // OS threads
  int init_by = -1;                            // the thread whose mbarrier.init made it
  uint32_t fenced_at = kUnfenced;              // its barrier count at its fence.mbarrier_init
  uint32_t arrived_fences = 0, released_fences = 0;  // the latest fence.proxy.async its arrivals (this
                                                     // phase) / its last completed phase ordered
};
struct TmaCopy {
  unsigned char* dst;
  TensorMapModel map;
  int c0, c1;
  const void* bar;
  uint32_t bytes;
};
struct WgmmaOp {
  uint64_t a, b;
  int n, elem_bytes;
  bool bf16, tf32, trans_a, trans_b, scale_d;
  float* d;
  bool chained;      // C is what the op before it on the same registers leaves there
  float c[128];      // otherwise C, as the registers held it at issue
};
// What the last completed wgmma on an accumulator left there, and the thread's wgmma.fence count
// then: a later wgmma on it that finds other values needs a wgmma.fence after that.
struct WgmmaLeft {
  float* d;
  int n;
  unsigned fences;
  float v[128];
};
struct WgmmaThread {
  std::vector<WgmmaOp> ops;
  std::vector<size_t> group_ends;
  unsigned fences = 0;  // wgmma.fence's in this block
  std::vector<WgmmaLeft> left;
};
constexpr uint32_t kPoisonBits = 0x7fa00badu;

struct HopperState {
  std::mutex mutex;
  std::atomic<unsigned char*> window{nullptr};
  std::map<const void*, MBarrier> bars;
  std::vector<TmaCopy> tma;  // in flight
  std::vector<WgmmaThread> wgmma = std::vector<WgmmaThread>(1024);
  bool protocol_failed = false;
  ProxyView proxy;  // (fibers only)
  RegisterPool pool;
  std::vector<unsigned char> armed = std::vector<unsigned char>(1024);  // per thread: wgmma's in flight
  std::atomic<bool> proxy_reported{false}, fence_reported{false}, init_reported{false}, pool_reported{false};
};
inline HopperState& hopper() {
  static HopperState* state = new HopperState;  // one launch at a time (emu::launch is serialised)
  return *state;
}
// Called by every Hopper instruction: marks the launch, so the scheduler calls the hooks below.
inline HopperState& hopper_here() {
  current_block->hopper.store(true);
  return hopper();
}

inline uint32_t window_offset(const void* p) {
  unsigned char* w = hopper().window.load();
  if (w == nullptr) {
    std::fprintf(stderr, "cuda_emu: a descriptor or barrier names shared memory before shared_window() "
                         "announced the kernel's arena\n");
    std::abort();
  }
  return uint32_t(static_cast<const unsigned char*>(p) - w);
}

// Execute one TMA copy: every element of the box, zero outside the tensor, swizzled by address.
inline void land(const TmaCopy& c) {
  const TensorMapModel& m = c.map;
  const uint32_t E = m.elem_bytes, row_bytes = m.box[0] * E;
  for (uint32_t y = 0; y < m.box[1]; ++y)
    for (uint32_t x = 0; x < m.box[0]; ++x) {
      const int64_t gx = int64_t(c.c0) + x, gy = int64_t(c.c1) + y;
      const bool inside = gx >= 0 && gy >= 0 && uint64_t(gx) < m.dim[0] && uint64_t(gy) < m.dim[1];
      const uintptr_t logical = reinterpret_cast<uintptr_t>(c.dst) + y * row_bytes + x * E;
      unsigned char* to = reinterpret_cast<unsigned char*>(swizzled(uint32_t(logical & 0xffffffffu), int(m.swizzle)) |
                                                           (logical & ~uintptr_t(0xffffffffu)));
      if (inside) std::memcpy(to, m.base + uint64_t(gy) * m.stride[0] + uint64_t(gx) * E, E);
      else std::memset(to, 0, E);
    }
}

inline void wake_waiters(MBarrier& b);

// The barrier's phase completes when no arrival and no byte is pending.
inline void maybe_complete(const void* bar, MBarrier& b) {
  if (b.pending == 0 && b.tx < 0) {
    protocol_error_report("mbarrier at shared offset %u received %lld bytes more than expect_tx announced",
                          window_offset(bar), static_cast<long long>(-b.tx));
    b.tx = 0;
  }
  if (b.pending == 0 && b.tx == 0) {
    if (tracing()) trace_event(-1, kTracePhase, window_offset(bar), b.phase);
    ++b.phase;
    b.pending = b.count;
    b.released_fences = b.arrived_fences;
    b.arrived_fences = 0;
    wake_waiters(b);
  }
}

// Land every copy in flight that completes `bar` (with the state's mutex held).
inline void deliver(HopperState& s, const void* bar) {
  for (size_t i = 0; i < s.tma.size();) {
    if (s.tma[i].bar != bar) {
      ++i;
      continue;
    }
    const TmaCopy c = s.tma[i];
    s.tma.erase(s.tma.begin() + long(i));
    land(c);
    if (tracing()) trace_event(-1, kTraceLanded, window_offset(bar), c.bytes);
    proxy_async_wrote(s.proxy, c.dst, c.bytes);  // the async proxy's own writes
    MBarrier& b = s.bars[bar];
    b.tx -= c.bytes;
    maybe_complete(bar, b);
  }
}

// ---------------------------------------------------------------------------------------------
// The instructions.
// ---------------------------------------------------------------------------------------------
// `bytes`: the arena's size, whose generic writes the async proxy's view tracks (0: unknown, untracked).
inline void shared_window(void* arena, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(arena) % 1024 != 0) {
    std::fprintf(stderr, "cuda_emu: shared_window(): the arena must be 1024-byte aligned (the swizzles' period)\n");
    std::abort();
  }
  HopperState& s = hopper_here();
  s.window.store(static_cast<unsigned char*>(arena));
  if (kProxyTracked && bytes > 0) {
    std::lock_guard<std::mutex> lock(s.mutex);
    proxy_begin(s.proxy, static_cast<unsigned char*>(arena), bytes);
  }
}

inline void mbarrier_init(void* bar, unsigned count) {
  HopperState& s = hopper_here();
  std::lock_guard<std::mutex> lock(s.mutex);
  MBarrier& b = s.bars[bar];
  b.count = b.pending = count;
  b.phase = 0;
  b.tx = 0;
  b.init_by = int(thread_index());
  b.fenced_at = kUnfenced;
  if (tracing()) trace_event(int(thread_index()), kTraceInit, window_offset(bar), count);
}

// fence.mbarrier_init (and fence.proxy.async, which orders them too): the thread's mbarrier.init's
// become visible to the async proxy, once a barrier orders the fence before another thread's use.
inline void fence_barrier_inits(HopperState& s, unsigned t) {
  for (auto& [bar, b] : s.bars)
    if (b.init_by == int(t) && b.fenced_at == kUnfenced) b.fenced_at = current_block->syncs[t];
}
inline void fence_mbarrier_init() {
  HopperState& s = hopper_here();
  std::lock_guard<std::mutex> lock(s.mutex);
  fence_barrier_inits(s, thread_index());
}
// fence.proxy.async: the thread's generic writes to shared memory become visible to the async proxy.
inline void fence_proxy_async() {
  HopperState& s = hopper_here();
  const unsigned t = thread_index();
  std::lock_guard<std::mutex> lock(s.mutex);
  fence_barrier_inits(s, t);
  if (kProxyTracked) proxy_fence(s.proxy, t, current_block->syncs[t]);
}

inline MBarrier& initialised(HopperState& s, const void* bar, const char* what) {
  auto it = s.bars.find(bar);
  if (it == s.bars.end()) {
    std::fprintf(stderr, "cuda_emu: %s on shared offset %u, which no mbarrier.init made a barrier\n", what,
                 window_offset(bar));
    std::abort();
  }
  return it->second;
}

// mbarrier.arrive (with expect_tx bytes announced first, for mbarrier.arrive.expect_tx).
inline void mbarrier_arrive(void* bar, uint32_t expect_bytes = 0) {
  HopperState& s = hopper_here();
  std::lock_guard<std::mutex> lock(s.mutex);
  MBarrier& b = initialised(s, bar, "mbarrier.arrive");
  if (tracing()) trace_event(int(thread_index()), kTraceArrive, window_offset(bar), expect_bytes);
  b.tx += expect_bytes;
  b.arrived_fences = std::max(b.arrived_fences, s.proxy.last_fence[thread_index()]);
  if (b.pending == 0) {
    protocol_error_report("mbarrier at shared offset %u: more arrivals than its count (%u) in one phase",
                          window_offset(bar), b.count);
    return;
  }
  --b.pending;
  maybe_complete(bar, b);
}

// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [map, {c0, c1}], [bar]
// (Not inlined: its return address is the kernel's instruction, for the reports.)
__attribute__((noinline)) inline void tma_load_2d(void* dst, const void* map, int c0, int c1, void* bar) {
  const void* pc = __builtin_return_address(0);
  HopperState& s = hopper_here();
  TensorMapModel m;
  std::memcpy(&m, map, sizeof(m));
  if (m.magic != kTensorMapMagic) {
    std::fprintf(stderr, "cuda_emu: cp.async.bulk.tensor with a tensor map that cuTensorMapEncodeTiled did not make\n");
    std::abort();
  }
  if (reinterpret_cast<uintptr_t>(dst) % 128 != 0) {
    std::fprintf(stderr, "cuda_emu: cp.async.bulk.tensor: the destination must be 128-byte aligned\n");
    std::abort();
  }
  const uint32_t bytes = m.box[0] * m.box[1] * m.elem_bytes;
  std::lock_guard<std::mutex> lock(s.mutex);
  MBarrier& b = initialised(s, bar, "cp.async.bulk.tensor");
  const unsigned t = thread_index();
  if (b.fenced_at == kUnfenced)
    report_once(s.init_reported, "cp.async.bulk.tensor by thread %u at %s completes on the mbarrier at shared offset "
                "%u, which thread %d initialised (mbarrier.init, a generic write) with no fence.mbarrier_init or "
                "fence.proxy.async since: the copy engine (the async proxy) may not see the initialisation", t,
                code_address(pc).text, window_offset(bar), b.init_by);
  else if (int(t) != b.init_by && !(current_block->syncs[t] > b.fenced_at))
    report_once(s.init_reported, "cp.async.bulk.tensor by thread %u at %s completes on the mbarrier at shared offset "
                "%u, which thread %d initialised and fenced, but no __syncthreads ordered that fence before this copy",
                t, code_address(pc).text, window_offset(bar), b.init_by);
  std::memset(dst, 0xff, bytes);  // in flight: NaN in every float type until the bytes land
  proxy_async_wrote(s.proxy, static_cast<unsigned char*>(dst), bytes);
  s.tma.push_back({static_cast<unsigned char*>(dst), m, c0, c1, bar, bytes});
  if (tracing()) trace_event(int(t), kTraceTmaIssue, window_offset(bar), bytes);
  // A consumer may already wait on this barrier, having found nothing to land: wake it to land this.
  wake_waiters(b);
}

// mbarrier.try_wait.parity: true once the phase of this parity has completed. Here it waits until
// then (a GPU's try_wait returns false after a while and the kernel's loop asks again).
inline bool mbarrier_try_wait_parity(void* bar, unsigned parity) {
  HopperState& s = hopper_here();
  std::unique_lock<std::mutex> lock(s.mutex);
  if (tracing()) trace_event(int(thread_index()), kTraceWaitBegin, window_offset(bar), parity & 1u);
  for (bool again = false;; again = true) {
    MBarrier& b = initialised(s, bar, "mbarrier.try_wait.parity");
    if ((b.phase & 1u) != (parity & 1u) || (deliver(s, bar), (b.phase & 1u) != (parity & 1u))) {
      if (tracing()) trace_event(int(thread_index()), kTraceWaitEnd, window_offset(bar), parity & 1u);
      uint32_t& waited = s.proxy.waited[thread_index()];  // the fences the phase's arrivals made
      waited = std::max(waited, b.released_fences);
      return true;
    }
#ifdef CUDA_EMU_THREADS
    if (b.changed.wait_for(lock, std::chrono::seconds(30)) == std::cv_status::timeout) {
      std::fprintf(stderr, "cuda_emu: a thread waited 30 s on the mbarrier at shared offset %u (phase %u, %u of %u "
                   "arrivals and %lld transaction bytes pending): a hang on a GPU\n", window_offset(bar), b.phase,
                   b.pending, b.count, static_cast<long long>(b.tx));
      std::abort();
    }
#else
    lock.unlock();
    fiber_quiet = again;  // (resumed from an earlier suspend here: nothing of the kernel's ran since)
    executor().suspend(b.waiting);  // resumed when the phase completes, or never (reported)
    fiber_quiet = false;
    lock.lock();
#endif
  }
}

inline void wake_waiters(MBarrier& b) {
#ifdef CUDA_EMU_THREADS
  b.changed.notify_all();
#else
  executor().wake(b.waiting);
#endif
}

// ---- wgmma ----
// Every thread of the warpgroup issues the same instruction: the first thing checked.
inline void same_in_warpgroup(const char* what, uint64_t a, uint64_t b) {
  const unsigned t = thread_index();
  if (blockDim.x * blockDim.y * blockDim.z < (t / 128 + 1) * 128) {
    std::fprintf(stderr, "cuda_emu: %s needs all 128 threads of a warpgroup, and this block's warpgroup %u is short\n",
                 what, t / 128);
    std::abort();
  }
  Warpgroup& g = current_block->warpgroups[t / 128];
  const uint64_t mine[2] = {a, b};
  std::memcpy(g.slot[t % 128], mine, 16);
#ifndef CUDA_EMU_THREADS
  executor().switched();
#endif
  g.barrier.wait();
  uint64_t first[2];
  std::memcpy(first, g.slot[0], 16);
  const bool same = std::memcmp(first, mine, 16) == 0;
#ifndef CUDA_EMU_THREADS
  fiber_quiet = executor().switched();  // resumed from the first wait: nothing of the kernel's ran since
#endif
  g.barrier.wait();
#ifndef CUDA_EMU_THREADS
  fiber_quiet = false;
#endif
  if (!same) protocol_error_report("%s: thread %u's operands differ from thread %u's of its warpgroup", what, t, t - t % 128);
}

// The async proxy's read of a wgmma's operands: every byte of A (64 × K) and B (N × K) must have
// been written by TMA, or by generic stores fenced and ordered before it (one thread of the
// warpgroup checks, after all 128 have issued).
inline void check_operands_seen(HopperState& s, const WgmmaOp& op, const void* pc) {
  const unsigned t = thread_index(), syncs = current_block->syncs[t];
  proxy_attribute(s.proxy, t);
  const Descriptor da = decode_descriptor(op.a), db = decode_descriptor(op.b);
  const int K = op.tf32 ? 8 : 16;
  for (int operand = 0; operand < 2; ++operand)
    for (int mn = 0; mn < (operand == 0 ? 64 : op.n); ++mn)
      for (int k = 0; k < K; ++k) {
        uint32_t addr = 0;
        int who = -1;
        if (!operand_address(operand == 0 ? da : db, operand == 0 ? op.trans_a : op.trans_b, mn, k, op.elem_bytes, addr))
          return;  // (wgmma_execute reports the descriptor)
        if (const char* why = proxy_unseen(s.proxy, addr, unsigned(op.elem_bytes), t, syncs, who)) {
          report_once(s.proxy_reported, "wgmma read shared offset %u (operand %c, row %d, k %d) written by thread %d "
                      "through the generic proxy %s: wgmma.mma_async of warpgroup %u at %s", addr, operand ? 'B' : 'A',
                      mn, k, who, why, t / 128, code_address(pc).text);
          return;
        }
      }
}

// (Not inlined: its return address is the kernel's instruction, for the reports.)
__attribute__((noinline)) inline void wgmma_issue(float* d, int n, uint64_t desc_a, uint64_t desc_b, bool scale_d,
                                                  bool trans_a, bool trans_b, bool bf16, bool tf32) {
  const void* pc = __builtin_return_address(0);
  HopperState& s = hopper_here();
  same_in_warpgroup("wgmma.mma_async", desc_a, desc_b ^ (uint64_t(n) << 1) ^ uint64_t(scale_d));
  const unsigned t = thread_index();
  WgmmaThread& me = s.wgmma[t];
  WgmmaOp op{desc_a, desc_b, n, tf32 ? 4 : 2, bf16, tf32, trans_a, trans_b, scale_d, d, false, {}};
  for (const WgmmaOp& earlier : me.ops) op.chained = op.chained || earlier.d == d;
  if (!op.chained) {
    // wgmma.fence: before the thread's first wgmma, and between other instructions' writes to the
    // accumulators and the next wgmma on them
    const WgmmaLeft* left = nullptr;
    for (const WgmmaLeft& l : me.left)
      if (l.d == d) left = &l;
    if (left == nullptr && me.fences == 0)
      report_once(s.fence_reported, "thread %u issued wgmma.mma_async at %s with no wgmma.fence before it: a "
                  "warpgroup's first wgmma must follow one", t, code_address(pc).text);
    else if (left != nullptr && left->fences == me.fences &&
             std::memcmp(left->v, d, sizeof(float) * size_t(n / 2)) != 0)
      report_once(s.fence_reported, "thread %u issued wgmma.mma_async at %s on accumulator registers that other "
                  "instructions wrote since the wgmma before it on them, with no wgmma.fence between", t,
                  code_address(pc).text);
    std::memcpy(op.c, d, sizeof(float) * size_t(n / 2));
  }
  if (kProxyTracked && t % 128 == 0) {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.proxy.base != nullptr) check_operands_seen(s, op, pc);
  }
  float poison;
  std::memcpy(&poison, &kPoisonBits, 4);
  for (int i = 0; i < n / 2; ++i) d[i] = poison;
  me.ops.push_back(op);
  if (tracing()) {
    std::lock_guard<std::mutex> lock(s.mutex);
    trace_event(int(t), kTraceWgmmaIssue, 0, n);
  }
  // from here until the wait that completes it, arithmetic on the poison traps
  fp_trap_install();
  s.armed[t] = 1;
  fp_trap_arm(true);
}

inline void wgmma_fence() { ++hopper_here().wgmma[thread_index()].fences; }

inline void wgmma_commit() {
  WgmmaThread& me = hopper_here().wgmma[thread_index()];
  me.group_ends.push_back(me.ops.size());
}

// One op, this thread's part: its N/2 elements of D from A and B in shared memory.
inline void wgmma_execute(HopperState& s, const WgmmaOp& op) {
  unsigned char* w = s.window.load();
  const Descriptor da = decode_descriptor(op.a), db = decode_descriptor(op.b);
  const int K = op.tf32 ? 8 : 16, t = int(thread_index() % 128);
  auto value = [&](const Descriptor& d, bool mn_major, int mn, int k) -> double {
    uint32_t addr = 0;
    if (!operand_address(d, mn_major, mn, k, op.elem_bytes, addr)) {
      protocol_error_report("wgmma: a descriptor this emulation does not model (base offset, or MN-major unswizzled)");
      return 0;
    }
    const unsigned char* p = w + addr;
#ifndef CUDA_EMU_THREADS  // (with OS threads, ThreadSanitizer reports such a read as a race instead)
    for (const TmaCopy& c : s.tma)
      if (p >= c.dst && p < c.dst + c.bytes && !s.protocol_failed) {
        s.protocol_failed = true;
        protocol_error_report("wgmma read shared offset %u, which a TMA copy has not delivered: its mbarrier's phase "
                              "has not completed (the bytes read are in flight)", addr);
      }
#endif
    if (op.tf32) {
      uint32_t bits;
      std::memcpy(&bits, p, 4);
      return emu_bits_to_float(bits & 0xffffe000u);
    }
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return op.bf16 ? bf16_bits_to_float(bits) : f16_bits_to_float(bits);
  };
  for (int i = 0; i < op.n / 2; ++i) {
    const RowCol rc = frag_wgmma_d(t, i);
    const float acc = !op.scale_d ? 0.0f : op.chained ? op.d[i] : op.c[i];
    double a[16], b[16];
    for (int k = 0; k < K; ++k) a[k] = value(da, op.trans_a, rc.row, k), b[k] = value(db, op.trans_b, rc.col, k);
    op.d[i] = tc_block(acc, a, b, K, op.tf32 ? kTcTf32 : op.bf16 ? kTcBf16 : kTcF16);  // tc_accumulate.h
  }
}

// wgmma.wait_group N: complete every group but the N most recent.
inline void wgmma_wait(int pending) {
  HopperState& s = hopper_here();
  WgmmaThread& me = s.wgmma[thread_index()];
  if (pending < 0 || me.group_ends.size() <= size_t(pending)) return;
  fp_trap_arm(false);  // (the products below may meet infinities and NaNs of the operands)
  const size_t groups = me.group_ends.size() - size_t(pending), done = me.group_ends[groups - 1];
  float poison;
  std::memcpy(&poison, &kPoisonBits, 4);
  for (size_t i = 0; i < done; ++i) {
    WgmmaOp& op = me.ops[i];
    bool untouched = true;
    for (int j = 0; j < op.n / 2 && !op.chained; ++j) untouched = untouched && std::memcmp(&op.d[j], &poison, 4) == 0;
    if (!untouched)
      protocol_error_report("thread %u wrote wgmma accumulator registers while the wgmma was in flight",
                            thread_index());
    wgmma_execute(s, op);
  }
  // An op still in flight that goes on from registers completed here takes their value now, and
  // they hold poison again until it completes.
  for (size_t j = done; j < me.ops.size(); ++j) {
    WgmmaOp& later = me.ops[j];
    bool first = later.chained;
    for (size_t i = done; i < j && first; ++i) first = me.ops[i].d != later.d;
    if (!first) continue;
    std::memcpy(later.c, later.d, sizeof(float) * size_t(later.n / 2));
    later.chained = false;
    for (int e = 0; e < later.n / 2; ++e) later.d[e] = poison;
  }
  // What the completed ops leave in registers no op in flight goes on from, for wgmma.fence's rule.
  for (size_t i = 0; i < done; ++i) {
    const WgmmaOp& op = me.ops[i];
    bool still = false;
    for (size_t j = done; j < me.ops.size(); ++j) still = still || me.ops[j].d == op.d;
    if (still) continue;
    WgmmaLeft* left = nullptr;
    for (WgmmaLeft& l : me.left)
      if (l.d == op.d) left = &l;
    if (left == nullptr) left = &me.left.emplace_back();
    left->d = op.d;
    left->n = op.n;
    left->fences = me.fences;
    std::memcpy(left->v, op.d, sizeof(float) * size_t(op.n / 2));
  }
  me.ops.erase(me.ops.begin(), me.ops.begin() + long(done));
  me.group_ends.erase(me.group_ends.begin(), me.group_ends.begin() + long(groups));
  for (size_t& end : me.group_ends) end -= done;
  s.armed[thread_index()] = !me.ops.empty();
  fp_trap_arm(!me.ops.empty());
  if (tracing()) {
    std::lock_guard<std::mutex> lock(s.mutex);
    trace_event(int(thread_index()), kTraceWgmmaWait, 0, int64_t(groups));
  }
}

// setmaxnreg.{inc,dec}.sync.aligned.u32: a multiple of 8 from 24 to 256, the same in the whole
// warpgroup; .dec gives the warpgroup's surplus to the block's pool, .inc takes from it and waits
// until it can (hopper_checks.h).
inline void setmaxnreg(unsigned regs, bool inc) {
  HopperState& s = hopper_here();
  if (regs < 24 || regs > 256 || regs % 8 != 0)
    protocol_error_report("setmaxnreg %u: the count must be a multiple of 8 from 24 to 256", regs);
  same_in_warpgroup("setmaxnreg", regs, inc);
  const unsigned t = thread_index();
  std::unique_lock<std::mutex> lock(s.mutex);
  RegisterPool& p = s.pool;
  if (p.launch == 0) {
    report_once(s.pool_reported, "setmaxnreg in a kernel that does not declare its registers a thread at launch "
                "(ptxas's count): the block's pool cannot be modelled");
    return;
  }
  RegisterGroup& g = p.groups[t / 128];
  const unsigned call = ++p.calls[t];
  if (call > g.requests) {  // the warpgroup's first thread here makes the request for all 128
    if (inc ? regs < g.regs : regs > g.regs)
      report_once(s.pool_reported, "setmaxnreg.%s to %u registers a thread from warpgroup %u's %u", inc ? "inc" : "dec",
                  regs, t / 128, g.regs);
    g.requests = call;
    g.want = regs;
    if (pool_grant(p)) {
#ifdef CUDA_EMU_THREADS
      p.changed.notify_all();
#else
      for (RegisterGroup& other : p.groups) executor().wake(other.waiting);
#endif
    }
  }
  while (g.granted < call) {
#ifdef CUDA_EMU_THREADS
    if (p.changed.wait_for(lock, std::chrono::seconds(30)) == std::cv_status::timeout) {
      pool_report_wait(p, t / 128, 128);
      std::abort();
    }
#else
    lock.unlock();
    executor().suspend(g.waiting);  // resumed when a decrease makes room, or never (reported)
    lock.lock();
#endif
  }
}

// ---- the scheduler's hooks ----
inline void hopper_reset(Block& block) {
  HopperState& s = hopper();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.window.store(nullptr);
  s.bars.clear();
  s.tma.clear();
  for (auto& t : s.wgmma) t = WgmmaThread{};
  s.protocol_failed = false;
  proxy_reset(s.proxy);
  pool_reset(s.pool, block.launch_registers, unsigned(block.syncs.size()));
  std::fill(s.armed.begin(), s.armed.end(), 0);
  for (auto* flag : {&s.proxy_reported, &s.fence_reported, &s.init_reported, &s.pool_reported, &fp_trap_reported})
    flag->store(false);
}
inline void hopper_thread_done(Block&) {
  HopperState& s = hopper();
  s.armed[thread_index()] = 0;
  fp_trap_arm(false);
  WgmmaThread& me = s.wgmma[thread_index()];
  if (!me.ops.empty()) {
    protocol_error_report("thread %u ended with %zu wgmma operation(s) never completed by wgmma.wait_group: its "
                          "accumulators held poison", thread_index(), me.ops.size());
    me = WgmmaThread{};
  }
}
inline unsigned hopper_waits(Block&) {
  HopperState& s = hopper();
  unsigned waiting = 0;
  for (auto& [bar, b] : s.bars) {
    waiting += unsigned(b.waiting.size());
    if (!b.waiting.empty())
      std::fprintf(stderr, "cuda_emu: %zu thread(s) wait on the mbarrier at shared offset %u: phase %u, %u of %u "
                   "arrivals and %lld transaction bytes still pending (a wrong expect_tx byte count, or an arrival "
                   "that never comes)\n", b.waiting.size(), window_offset(bar), b.phase, b.pending, b.count,
                   static_cast<long long>(b.tx));
  }
  for (size_t w = 0; w < s.pool.groups.size(); ++w)
    if (!s.pool.groups[w].waiting.empty())  // (counted "at a warp-wide instruction", which setmaxnreg is)
      pool_report_wait(s.pool, w, s.pool.groups[w].waiting.size());
  return waiting;
}
// With fibers: thread i is resumed (its trap armed if its accumulators are in flight), and has
// switched back (its shared-memory writes meanwhile attributed to it; the scheduler's own code runs
// with the trap off).
inline void hopper_enter(Block&, unsigned i) {
  if (hopper().armed[i]) fp_trap_arm(true);
}
inline void hopper_left(Block&, unsigned i) {
  HopperState& s = hopper();
  if (tracing()) ++trace_state().step;  // (fibers: the scheduler's thread, between fibers)
  fp_trap_arm(false);
  const bool quiet = fiber_quiet;  // (set by fiber i just before it switched; the next fiber sets its own)
  fiber_quiet = false;
  if (kProxyTracked && !quiet) proxy_attribute(s.proxy, i);
}
// The scheduler's hooks are set once, when the library loads, before any launch: a store from every
// emulated thread would be a data race (ThreadSanitizer's test finds one), even of the same value.
inline const bool hopper_installed = [] {
  hopper_block_start = hopper_reset;
  hopper_thread_end = hopper_thread_done;
  hopper_report_waits = hopper_waits;
  hopper_fiber_enter = hopper_enter;
  hopper_fiber_left = hopper_left;
  return true;
}();

}  // namespace emu
