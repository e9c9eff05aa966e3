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
//   accumulator registers hold a poison NaN (0x7FA00BAD): reading them early gets NaN, a thread
//   that ends with a group in flight is reported, and a write to them in flight is reported.
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

namespace emu {

inline void protocol_error_report(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void protocol_error_report(const char* fmt, ...) {
  std::va_list args;
  va_start(args, fmt);
  std::fputs("cuda_emu: ", stderr);
  std::vfprintf(stderr, fmt, args);
  std::fputc('\n', stderr);
  va_end(args);
  report_protocol_error();
}

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
struct WgmmaThread {
  std::vector<WgmmaOp> ops;
  std::vector<size_t> group_ends;
};
constexpr uint32_t kPoisonBits = 0x7fa00badu;

struct HopperState {
  std::mutex mutex;
  std::atomic<unsigned char*> window{nullptr};
  std::map<const void*, MBarrier> bars;
  std::vector<TmaCopy> tma;  // in flight
  std::vector<WgmmaThread> wgmma = std::vector<WgmmaThread>(1024);
  bool protocol_failed = false;
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
    ++b.phase;
    b.pending = b.count;
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
    MBarrier& b = s.bars[bar];
    b.tx -= c.bytes;
    maybe_complete(bar, b);
  }
}

// ---------------------------------------------------------------------------------------------
// The instructions.
// ---------------------------------------------------------------------------------------------
inline void shared_window(void* arena) {
  if (reinterpret_cast<uintptr_t>(arena) % 1024 != 0) {
    std::fprintf(stderr, "cuda_emu: shared_window(): the arena must be 1024-byte aligned (the swizzles' period)\n");
    std::abort();
  }
  hopper_here().window.store(static_cast<unsigned char*>(arena));
}

inline void mbarrier_init(void* bar, unsigned count) {
  HopperState& s = hopper_here();
  std::lock_guard<std::mutex> lock(s.mutex);
  MBarrier& b = s.bars[bar];
  b.count = b.pending = count;
  b.phase = 0;
  b.tx = 0;
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
  b.tx += expect_bytes;
  if (b.pending == 0) {
    protocol_error_report("mbarrier at shared offset %u: more arrivals than its count (%u) in one phase",
                          window_offset(bar), b.count);
    return;
  }
  --b.pending;
  maybe_complete(bar, b);
}

// cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [map, {c0, c1}], [bar]
inline void tma_load_2d(void* dst, const void* map, int c0, int c1, void* bar) {
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
  std::memset(dst, 0xff, bytes);  // in flight: NaN in every float type until the bytes land
  s.tma.push_back({static_cast<unsigned char*>(dst), m, c0, c1, bar, bytes});
  // A consumer may already wait on this barrier, having found nothing to land: wake it to land this.
  wake_waiters(b);
}

// mbarrier.try_wait.parity: true once the phase of this parity has completed. Here it waits until
// then (a GPU's try_wait returns false after a while and the kernel's loop asks again).
inline bool mbarrier_try_wait_parity(void* bar, unsigned parity) {
  HopperState& s = hopper_here();
  std::unique_lock<std::mutex> lock(s.mutex);
  for (;;) {
    MBarrier& b = initialised(s, bar, "mbarrier.try_wait.parity");
    if ((b.phase & 1u) != (parity & 1u)) return true;
    deliver(s, bar);
    if ((b.phase & 1u) != (parity & 1u)) return true;
#ifdef CUDA_EMU_THREADS
    if (b.changed.wait_for(lock, std::chrono::seconds(30)) == std::cv_status::timeout) {
      std::fprintf(stderr, "cuda_emu: a thread waited 30 s on the mbarrier at shared offset %u (phase %u, %u of %u "
                   "arrivals and %lld transaction bytes pending): a hang on a GPU\n", window_offset(bar), b.phase,
                   b.pending, b.count, static_cast<long long>(b.tx));
      std::abort();
    }
#else
    lock.unlock();
    executor().suspend(b.waiting);  // resumed when the phase completes, or never (reported)
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
  g.barrier.wait();
  uint64_t first[2];
  std::memcpy(first, g.slot[0], 16);
  const bool same = std::memcmp(first, mine, 16) == 0;
  g.barrier.wait();
  if (!same) protocol_error_report("%s: thread %u's operands differ from thread %u's of its warpgroup", what, t, t - t % 128);
}

inline void wgmma_issue(float* d, int n, uint64_t desc_a, uint64_t desc_b, bool scale_d, bool trans_a, bool trans_b,
                        bool bf16, bool tf32) {
  HopperState& s = hopper_here();
  same_in_warpgroup("wgmma.mma_async", desc_a, desc_b ^ (uint64_t(n) << 1) ^ uint64_t(scale_d));
  WgmmaThread& me = s.wgmma[thread_index()];
  WgmmaOp op{desc_a, desc_b, n, tf32 ? 4 : 2, bf16, tf32, trans_a, trans_b, scale_d, d, false, {}};
  for (const WgmmaOp& earlier : me.ops) op.chained = op.chained || earlier.d == d;
  if (!op.chained) std::memcpy(op.c, d, sizeof(float) * size_t(n / 2));
  float poison;
  std::memcpy(&poison, &kPoisonBits, 4);
  for (int i = 0; i < n / 2; ++i) d[i] = poison;
  me.ops.push_back(op);
}

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
  me.ops.erase(me.ops.begin(), me.ops.begin() + long(done));
  me.group_ends.erase(me.group_ends.begin(), me.group_ends.begin() + long(groups));
  for (size_t& end : me.group_ends) end -= done;
}

// setmaxnreg.{inc,dec}.sync.aligned.u32: moves registers between the warpgroups; here only its
// rules are checked (a multiple of 8 from 24 to 256, the same in the whole warpgroup).
inline void setmaxnreg(unsigned regs) {
  hopper_here();
  if (regs < 24 || regs > 256 || regs % 8 != 0)
    protocol_error_report("setmaxnreg %u: the count must be a multiple of 8 from 24 to 256", regs);
  same_in_warpgroup("setmaxnreg", regs, 0);
}

// ---- the scheduler's hooks ----
inline void hopper_reset(Block&) {
  HopperState& s = hopper();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.window.store(nullptr);
  s.bars.clear();
  s.tma.clear();
  for (auto& t : s.wgmma) t = WgmmaThread{};
  s.protocol_failed = false;
}
inline void hopper_thread_done(Block&) {
  HopperState& s = hopper();
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
  return waiting;
}
// The scheduler's hooks are set once, when the library loads, before any launch: a store from every
// emulated thread would be a data race (ThreadSanitizer's test finds one), even of the same value.
inline const bool hopper_installed = [] {
  hopper_block_start = hopper_reset;
  hopper_thread_end = hopper_thread_done;
  hopper_report_waits = hopper_waits;
  return true;
}();

}  // namespace emu
