//   python cuda/counters.py --help   (builds this file with counters.cpp, and runs them)
// Nsight Compute's memory counters, counted on the CPU: what the emulated threads load, store and
// copy, grouped into warp requests, then the 32-byte sectors of each global request and the
// wavefronts of each shared one.
//
// Two translation units make one library (cuda/counters.py builds it):
//   counted.cpp   the kernels and the emulator, compiled with GCC's -fsanitize=kernel-address and
//                 --param asan-instrumentation-with-call-threshold=0, so that every load and store
//                 the compiler keeps becomes a call __asan_load4_noabort(addr) (…8, …16, …N);
//   this file     those calls, compiled without instrumentation (it would call itself).
// The kernels' source is unchanged: what is counted is what the host compiler keeps of it (-O3
// without its vectoriser), which is close to what nvcc keeps, with one exception handled below.
// Not counted: an access at a constant index of a shared array (GCC does not instrument an
// access to a thread-local variable that it can prove in bounds); every index into shared memory
// in the chapter's kernels depends on threadIdx. Nor Hopper's operands: wgmma reads shared memory
// through matrix descriptors and TMA copies tiles, neither instrumented (cuda/counters.py leaves
// those versions out).
//
// The model, per block-wide interval (from one __syncthreads to the next):
//   - each thread's accesses to shared memory (this library's thread-local block) or to a buffer
//     the caller registered (global memory) are listed in program order; anything else (the
//     stack, the emulator's own data) is ignored;
//   - a cp.async (sm_80's LDGSTS: global to shared without registers) is one access of its own
//     kind, listed where it is issued (the emulator tells emu::count::cp_async); the bytes the
//     emulator moves when the copy completes are not instrumented;
//   - nvcc turns scalar shared accesses that cover an aligned 16- (or 8-) byte chunk into one
//     LDS.128 / STS.128 (it can prove the alignment of shared arrays, not of global pointers): a
//     thread's same-kind scalar shared accesses that cover a chunk are merged into one access at
//     the place of the first (cuda/static_report.py's census of LDS widths is the check);
//   - a warp's request is the i-th access of each of its lanes (lanes run the same instructions
//     where they do not diverge); lanes whose i-th access differs in space, kind (load, store,
//     copy) or width make separate requests;
//   - global: sectors = distinct 32-byte sectors the lanes touch (a copy's source);
//   - shared: 32 banks of 4 bytes. A request of 4-byte (or narrower) accesses is one phase of 32
//     lanes, 8-byte accesses two phases of 16, 16-byte four phases of 8 (as the hardware splits
//     them; a copy's destination alike). A phase takes as many wavefronts as the most distinct
//     4-byte words any one bank must deliver (lanes reading the same word share it: a broadcast).
//     One wavefront per phase is the ideal; the rest are the excessive wavefronts, which is what
//     bank conflicts cost. (ncu's hardware counter l1tex__data_bank_conflicts_* is another number:
//     on v3's stores, 32 consecutive words a warp, it counts some where the addresses make none.)
//   - ldmatrix (sm_75+'s LDSM): the emulator reads its rows uninstrumented and tells
//     emu::count_ldmatrix their addresses. A warp's ldmatrix is one request, counted as ncu counts
//     it: apart from the other shared loads (smsp__inst_executed_op_ldsm), its wavefronts and
//     excessive wavefronts among theirs (ncu's shared-load wavefronts hold LDSM's: its rule for
//     shared-memory conflicts divides them by the LDS and LDSM requests together). Each 8×8 matrix
//     is one phase: its 8 rows of 16 bytes, each on one group of 4 banks (the 32 banks hold 8 rows
//     of 16 bytes: a row's group is (address / 16) % 8). A phase takes as many wavefronts as the
//     most distinct rows any one group must deliver (lanes naming the same row share it), so an
//     .x4 takes 4 at best; the rest are its excessive wavefronts.
// Blocks: along each grid dimension the caller samples, only the first, second and last index run,
// the second standing for every interior one (its counts multiplied by n − 2): right where the
// interior blocks along it do the same work, which the caller knows of its kernel.
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

// warp_matrix.h gives emu::count_ldmatrix a weak no-op body; the definition at the end of this file
// replaces it in the library, so the header's copy is renamed out of this translation unit's way.
#define count_ldmatrix count_ldmatrix_header_default
#include "emulate/cuda_emu.h"
#undef count_ldmatrix

#define CNT_API extern "C" __attribute__((visibility("default")))


namespace emu::count {
namespace {

enum Op : uint8_t { kLoad, kStore, kCopy };  // kCopy: a cp.async, from global `addr` to shared `dst`
struct Access {
  uintptr_t addr, dst;
  uint32_t size;
  Op op;
  bool shared;  // (a copy is listed as global: its request is an LDGSTS, its source global memory)
};

// Per launch, in the order of the metric names in cuda/counters.py (METRICS).
enum Metric {
  kGldRequests, kGldSectors, kGstRequests, kGstSectors, kCopyRequests, kCopySectors,
  kSldRequests, kSldWavefronts, kSldExcessive, kLdsmRequests, kSstRequests, kSstWavefronts, kSstExcessive,
  kCopyWavefronts, kCopyExcessive, kBlocksRun, kBlocksStoodFor, kMetrics
};
struct Launch {
  double m[kMetrics] = {};
};

struct State {
  std::vector<std::pair<uintptr_t, uintptr_t>> globals;  // registered buffers [begin, end)
  std::vector<std::vector<Access>> streams;              // per thread of the running block
  std::vector<Launch> launches;
  unsigned grid[3] = {1, 1, 1}, threads = 0;
  unsigned sampled = 7;  // the grid dimensions sampled (bit d: dimension d); 0: every block runs
  bool recording = false;
  double weight = 1;  // how many blocks the running one stands for
  bool busy = false;  // guards against counting the counters' own accesses
};
State& state() {
  static State* s = new State;
  return *s;
}

// Shared memory: this library's thread-local block (cuda_emu.h makes every __shared__ array
// thread-local in the counting build). Each OS thread has its own block, so its bounds are found
// per thread, the first time that thread counts: its address from dlinfo, its size from the
// PT_TLS segment of the library's program headers.
thread_local volatile char tls_anchor;  // written first: the block exists before dlinfo asks for it
thread_local uintptr_t shared_begin = 0, shared_end = 0;
bool find_shared() {
  if (shared_end > shared_begin) return true;
  tls_anchor = 1;
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&find_shared), &info)) return false;
  void* self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (self == nullptr) return false;
  void* block = nullptr;
  size_t modid = 0;
  if (dlinfo(self, RTLD_DI_TLS_DATA, &block) == 0 && dlinfo(self, RTLD_DI_TLS_MODID, &modid) == 0 && block) {
    struct Find {
      size_t modid, size;
    } find{modid, 0};
    dl_iterate_phdr(
        [](dl_phdr_info* p, size_t, void* f) {
          auto* want = static_cast<Find*>(f);
          if (p->dlpi_tls_modid != want->modid) return 0;
          for (int i = 0; i < p->dlpi_phnum; ++i)
            if (p->dlpi_phdr[i].p_type == PT_TLS) want->size = p->dlpi_phdr[i].p_memsz;
          return 1;
        },
        &find);
    shared_begin = reinterpret_cast<uintptr_t>(block);
    shared_end = shared_begin + find.size;
  }
  dlclose(self);
  return shared_end > shared_begin;
}
bool is_shared(uintptr_t a) { return a >= shared_begin && a < shared_end; }
bool is_global(const State& s, uintptr_t a) {
  for (const auto& [b, e] : s.globals)
    if (a >= b && a < e) return true;
  return false;
}

void push(const Access& a) {
  State& s = state();
  s.busy = true;
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  if (t < s.streams.size()) s.streams[t].push_back(a);
  s.busy = false;
}

void record(uintptr_t addr, uint32_t size, bool store) {
  State& s = state();
  if (!s.recording || s.busy) return;
  const bool shared = is_shared(addr);
  if (!shared && !is_global(s, addr)) return;
  push({addr, 0, size, store ? kStore : kLoad, shared});
}

// nvcc's vectorisation of shared accesses: scalar accesses of one thread, one direction and one
// width that together cover an aligned 16-byte (else 8-byte) chunk become one wide access.
struct Keyed {
  uint64_t key;
  size_t index;
  bool operator<(const Keyed& o) const { return key < o.key || (key == o.key && index < o.index); }
};
uint64_t key_of(uintptr_t a, uint32_t size, Op op) { return (uint64_t(a) << 6) | (uint64_t(size) << 1) | (op == kStore); }

void vectorise_shared(std::vector<Access>& stream) {
  static std::vector<Keyed> sorted;  // (reused: this runs once per thread and interval)
  static std::vector<char> gone;
  static std::vector<size_t> parts;
  sorted.clear();
  for (size_t i = 0; i < stream.size(); ++i)
    if (stream[i].shared && stream[i].size < 16) sorted.push_back({key_of(stream[i].addr, stream[i].size, stream[i].op), i});
  if (sorted.size() < 2) return;
  std::sort(sorted.begin(), sorted.end());
  gone.assign(stream.size(), 0);
  // the first access at or after `from`, not yet merged, to this address with this width and direction
  auto next = [&](uintptr_t a, uint32_t size, Op op, size_t from) -> long {
    const uint64_t k = key_of(a, size, op);
    for (auto it = std::lower_bound(sorted.begin(), sorted.end(), Keyed{k, from}); it != sorted.end() && it->key == k; ++it)
      if (!gone[it->index]) return long(it->index);
    return -1;
  };
  for (size_t i = 0; i < stream.size(); ++i) {
    Access& x = stream[i];
    if (gone[i] || !x.shared || x.size >= 16 || x.addr % x.size != 0) continue;
    for (uint32_t width : {16u, 8u}) {
      if (width <= x.size) continue;
      const uintptr_t chunk = x.addr & ~uintptr_t(width - 1);
      parts.clear();
      bool whole = true;
      for (uintptr_t a = chunk; a < chunk + width && whole; a += x.size) {
        if (a == x.addr) continue;
        const long j = next(a, x.size, x.op, i + 1);
        if (j < 0) whole = false;
        else parts.push_back(size_t(j));
      }
      if (!whole) continue;
      for (size_t j : parts) gone[j] = 1;
      x.addr = chunk;
      x.size = width;
      break;
    }
  }
  size_t w = 0;
  for (size_t i = 0; i < stream.size(); ++i)
    if (!gone[i]) stream[w++] = stream[i];
  stream.resize(w);
}

// How many distinct values; sorts them.
size_t distinct(uintptr_t* v, size_t n) {
  std::sort(v, v + n);
  return size_t(std::unique(v, v + n) - v);
}

// The distinct 32-byte sectors of one global request (a copy's: of its sources).
double sectors(const Access* const* lanes, size_t count) {
  uintptr_t buf[32 * 5];
  size_t n = 0;
  for (size_t i = 0; i < count; ++i)
    for (uintptr_t s = lanes[i]->addr / 32; s <= (lanes[i]->addr + lanes[i]->size - 1) / 32 && n < 32 * 5; ++s)
      buf[n++] = s;
  return double(distinct(buf, n));
}

// The wavefronts of one shared request at the lanes' shared addresses (a copy's destination), and
// its phases: the ideal, one wavefront each.
struct Wavefronts {
  double wavefronts = 0, phases = 0;
};
Wavefronts shared_wavefronts(const Access* const* lanes, const unsigned* lane_ids, size_t count) {
  const Access& a0 = *lanes[0];
  uintptr_t buf[32 * 5];
  Wavefronts out;
  // region shared-request
  // Phases: 32 lanes for <= 4 bytes, 16 for 8, 8 for 16.
  const unsigned per_phase = a0.size <= 4 ? 32 : a0.size == 8 ? 16 : 8;
  for (unsigned p = 0; p < 32 / per_phase; ++p) {
    size_t n = 0;
    for (size_t i = 0; i < count; ++i) {
      if (lane_ids[i] / per_phase != p) continue;
      const uintptr_t a = lanes[i]->op == kCopy ? lanes[i]->dst : lanes[i]->addr;
      for (uintptr_t w = a / 4; w <= (a + lanes[i]->size - 1) / 4 && n < 32 * 5; ++w) buf[n++] = w;
    }
    if (n == 0) continue;
    const size_t words = distinct(buf, n);  // each distinct word once (lanes reading one word share it)
    unsigned per_bank[32] = {};
    unsigned most = 1;
    for (size_t i = 0; i < words; ++i) most = std::max(most, ++per_bank[buf[i] % 32]);
    out.wavefronts += double(most);
    out.phases += 1;  // the ideal: every bank delivers each word it holds in one wavefront
  }
  // endregion
  return out;
}

// One request: the accesses of the lanes that take part (at most 32, each at most 16 bytes).
void account(const Access* const* lanes, const unsigned* lane_ids, size_t count, Launch& l, double weight) {
  const Access& a0 = *lanes[0];
  if (a0.op == kCopy) {  // LDGSTS: a global request for the sources, shared wavefronts for the destinations
    const Wavefronts w = shared_wavefronts(lanes, lane_ids, count);
    l.m[kCopyRequests] += weight;
    l.m[kCopySectors] += weight * sectors(lanes, count);
    l.m[kCopyWavefronts] += weight * w.wavefronts;
    l.m[kCopyExcessive] += weight * (w.wavefronts - w.phases);
    return;
  }
  const bool store = a0.op == kStore;
  if (!a0.shared) {
    l.m[store ? kGstRequests : kGldRequests] += weight;
    l.m[store ? kGstSectors : kGldSectors] += weight * sectors(lanes, count);
    return;
  }
  const Wavefronts w = shared_wavefronts(lanes, lane_ids, count);
  l.m[store ? kSstRequests : kSldRequests] += weight;
  l.m[store ? kSstWavefronts : kSldWavefronts] += weight * w.wavefronts;
  l.m[store ? kSstExcessive : kSldExcessive] += weight * (w.wavefronts - w.phases);
}

}  // namespace

void launch_begin(unsigned gx, unsigned gy, unsigned gz, unsigned threads) {
  find_shared();  // (this OS thread's block: a launch runs on the thread that asked for it)
  State& s = state();
  s.grid[0] = gx, s.grid[1] = gy, s.grid[2] = gz;
  s.threads = threads;
  s.streams.assign(threads, {});
  s.launches.emplace_back();
  s.recording = true;
}

bool block_wanted() {
  State& s = state();
  const unsigned idx[3] = {blockIdx.x, blockIdx.y, blockIdx.z};
  double weight = 1;
  for (int d = 0; d < 3; ++d) {
    const unsigned i = idx[d], n = s.grid[d];
    if (!(s.sampled >> d & 1u)) continue;
    if (i == 0 || i + 1 == n) continue;        // the first and the last stand for themselves
    if (i == 1) weight *= double(n - 2);       // the second for every interior index
    else return false;
  }
  s.weight = weight;
  s.launches.back().m[kBlocksRun] += 1;
  s.launches.back().m[kBlocksStoodFor] += weight;
  return true;
}

void interval_end() {
  State& s = state();
  s.busy = true;
  Launch& l = s.launches.back();
  for (auto& stream : s.streams) vectorise_shared(stream);
  for (unsigned w = 0; w * 32 < s.threads; ++w) {
    const unsigned lanes = std::min(32u, s.threads - w * 32);
    const std::vector<Access>* lane_stream = &s.streams[w * 32];
    size_t longest = 0;
    for (unsigned i = 0; i < lanes; ++i) longest = std::max(longest, lane_stream[i].size());
    for (size_t k = 0; k < longest; ++k) {
      // the k-th access of each lane, split by (space, direction, width)
      const Access* group[32];
      unsigned ids[32];
      bool done[32] = {};
      for (unsigned first = 0; first < lanes; ++first) {
        if (done[first] || k >= lane_stream[first].size()) continue;
        const Access& a = lane_stream[first][k];
        size_t count = 0;
        for (unsigned i = first; i < lanes; ++i) {
          if (done[i] || k >= lane_stream[i].size()) continue;
          const Access& b = lane_stream[i][k];
          if (b.shared != a.shared || b.op != a.op || b.size != a.size) continue;
          group[count] = &b;
          ids[count++] = i;
          done[i] = true;
        }
        account(group, ids, count, l, s.weight);
      }
    }
  }
  for (auto& stream : s.streams) stream.clear();
  s.busy = false;
}

void launch_end() { state().recording = false; }

// A cp.async as issued: one LDGSTS access of the issuing thread, counted as ncu counts LDGSTS
// (op_ldgsts), neither a global load nor a shared store.
void cp_async(const void* shared_dst, const void* global_src, unsigned bytes) {
  State& s = state();
  const auto src = reinterpret_cast<uintptr_t>(global_src), dst = reinterpret_cast<uintptr_t>(shared_dst);
  if (!s.recording || s.busy || !is_global(s, src) || !is_shared(dst)) return;
  push({src, dst, bytes, kCopy, false});
}

// The wavefronts of one ldmatrix of `matrices` 8×8 matrices, whose rows lanes 0 to 8·matrices − 1
// give (lane 8j + r: row r of matrix j); its phases are its matrices.
double ldmatrix_wavefronts(const void* const* rows, int matrices) {
  double wavefronts = 0;
  // region ldmatrix-phases
  for (int j = 0; j < matrices; ++j) {
    uintptr_t row[8];
    for (int r = 0; r < 8; ++r) row[r] = reinterpret_cast<uintptr_t>(rows[8 * j + r]) / 16;
    const size_t distinct_rows = distinct(row, 8);  // (lanes naming the same row share it)
    unsigned per_group[8] = {};
    unsigned most = 1;
    for (size_t i = 0; i < distinct_rows; ++i) most = std::max(most, ++per_group[row[i] % 8]);
    wavefronts += double(most);
  }
  // endregion
  return wavefronts;
}

}  // namespace emu::count

// One ldmatrix, as lane 0 of the warp issues it: counted at once, a request of its own (no other
// access of any lane joins it), into the launch of the block that runs it.
namespace emu {
void count_ldmatrix(const void* const* rows, int matrices) {
  using namespace emu::count;
  State& s = state();
  if (!s.recording || s.busy || matrices < 1 || matrices > 4) return;
  for (int i = 0; i < 8 * matrices; ++i)
    if (!is_shared(reinterpret_cast<uintptr_t>(rows[i]))) return;
  const double wavefronts = ldmatrix_wavefronts(rows, matrices);
  count::Launch& l = s.launches.back();
  l.m[kLdsmRequests] += s.weight;
  l.m[kSldWavefronts] += s.weight * wavefronts;
  l.m[kSldExcessive] += s.weight * (wavefronts - matrices);
}
}  // namespace emu

// The compiler's instrumentation calls these (GCC's kernel-address names).
#define CNT_HOOK(N)                                                                                       \
  CNT_API void __asan_load##N##_noabort(uintptr_t a) { emu::count::record(a, N, false); }                \
  CNT_API void __asan_store##N##_noabort(uintptr_t a) { emu::count::record(a, N, true); }
CNT_HOOK(1)
CNT_HOOK(2)
CNT_HOOK(4)
CNT_HOOK(8)
CNT_HOOK(16)
CNT_API void __asan_loadN_noabort(uintptr_t a, size_t n) { emu::count::record(a, uint32_t(n), false); }
CNT_API void __asan_storeN_noabort(uintptr_t a, size_t n) { emu::count::record(a, uint32_t(n), true); }
CNT_API void __asan_handle_no_return() {}
// Around the kernels' registrations (entries.cuh: globals with constructors), for the sanitizer's
// initialisation-order check, which the counters do not need.
CNT_API void __asan_before_dynamic_init(const char*) {}
CNT_API void __asan_after_dynamic_init() {}

// The C interface (cuda/counters.py).
CNT_API int cnt_reset(int sampled_dims) {
  auto& s = emu::count::state();
  s.globals.clear();
  s.launches.clear();
  s.sampled = unsigned(sampled_dims) & 7u;
  return emu::count::find_shared() ? 0 : 1;  // 1: this thread's shared memory not found
}
CNT_API int64_t cnt_shared_bytes() { return int64_t(emu::count::shared_end - emu::count::shared_begin); }
CNT_API void cnt_add_global(const void* p, int64_t bytes) {
  const auto b = reinterpret_cast<uintptr_t>(p);
  emu::count::state().globals.push_back({b, b + uintptr_t(bytes)});
}
CNT_API int cnt_launches() { return int(emu::count::state().launches.size()); }
CNT_API int cnt_metrics() { return emu::count::kMetrics; }
CNT_API void cnt_read(int launch, double* out) {
  const auto& l = emu::count::state().launches.at(size_t(launch));
  std::memcpy(out, l.m, sizeof(l.m));
}
// One warp's shared load of `size`-byte accesses, lane lane_ids[i] at shared byte address addrs[i]:
// its wavefronts by the rule every counted request takes (shared_wavefronts), and its phases (the
// ideal) into *phases. For a figure that draws one request (cuda/figures.py's banks).
CNT_API double cnt_shared_wavefronts(const uint64_t* addrs, const unsigned* lane_ids, int count, unsigned size,
                                     double* phases) {
  std::vector<emu::count::Access> accesses(static_cast<size_t>(count));
  std::vector<const emu::count::Access*> lanes(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    accesses[size_t(i)] = {uintptr_t(addrs[i]), 0, size, emu::count::kLoad, true};
    lanes[size_t(i)] = &accesses[size_t(i)];
  }
  const auto w = emu::count::shared_wavefronts(lanes.data(), lane_ids, size_t(count));
  *phases = w.phases;
  return w.wavefronts;
}
