//   pytest tests/test_hopper.py -k "fence or register"   (each rule, kept and broken: a probe kernel, planted copies)
// The rules of Hopper's asynchronous instructions that the emulation checks beyond their results:
// the async proxy and its fences, wgmma.fence, the accumulators in flight, and setmaxnreg's
// register pool. Included by hopper.h (which says what each instruction does); the state lives in
// hopper.h's HopperState, under its mutex where OS threads share it.
//
// - The async proxy (PTX ISA, "Memory Consistency Model", proxies). The tensor cores (wgmma's
//   shared-memory operands) and the copy engine (TMA) reach shared memory through the async proxy;
//   ordinary stores go through the generic proxy, and the async proxy sees them only after the
//   writing thread's fence.proxy.async, itself ordered (here: by a __syncthreads) before the read.
//   With fibers (one emulated thread runs at a time), the bytes of the shared window that changed
//   while thread t ran are its generic writes: the scheduler compares the window with a copy of it
//   at every switch (ProxyView). A wgmma whose operand bytes were written so, with no
//   fence.proxy.async by the writer since (or a fence nothing orders before the wgmma), is
//   reported with the byte's offset, the writer, and the wgmma's code address. What orders a fence
//   before a read: a __syncthreads after it (exactly: the barriers each thread has passed), the
//   same warpgroup, or an mbarrier phase the writer arrived at after its fence and the reader waited
//   for (approximately: a phase carries the latest fence of its arrivals, a thread the latest
//   such fence it waited for, and a fence at or before that counts as ordered). A store of the
//   value a byte already held changes nothing the async proxy could read, and is not seen. With
//   OS threads (ThreadSanitizer's build) the writes cannot be attributed: not checked there.
// - mbarrier.init is a generic write too: a TMA copy that completes on a barrier whose
//   initialisation no fence.mbarrier_init (or fence.proxy.async) by the initialising thread made
//   visible to the async proxy is reported (both builds).
// - wgmma.fence (both builds): a thread's first wgmma.mma_async of the block must follow a
//   wgmma.fence, and so must one whose accumulators other instructions wrote since the wgmma
//   before it on them completed (its values are kept at the wgmma.wait_group, compared at the next
//   issue). Reads by other instructions leave no trace there: only writes are checked.
// - Accumulators in flight: between a wgmma and the wgmma.wait_group that completes it, its
//   registers hold a signalling NaN, and the thread runs with the floating-point "invalid"
//   exception unmasked (x86-64 only: MXCSR, per OS thread; with fibers the scheduler arms it per
//   fiber). Arithmetic, a comparison or a conversion that reads such a register traps: reported
//   with the thread and the instruction's address (addr2line finds the line), and the launch fails.
//   A read that only copies the bits (a move, a store, the integer rounding to bfloat16) raises
//   nothing: a CPU cannot see a plain load of a local array without instrumenting every access.
//   Such a read still ends in the poison NaN in the output, and a write in flight is reported at
//   the wait. Off with -DCUDA_EMU_NO_FP_TRAP.
// - setmaxnreg: the block owns (registers a thread at launch) × (threads), the count ptxas gave
//   the kernel (which the kernel declares, and emulate.cpp passes to the launch). setmaxnreg.dec
//   gives a warpgroup's surplus back to the block's pool; setmaxnreg.inc takes from it, and waits
//   until the pool has enough. An increase that never comes is the hang it would be on a GPU:
//   the block stops, and the report names each warpgroup's count and what the waiting one needs.
#pragma once

#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <string>
#include <vector>
#if defined(__x86_64__) && !defined(CUDA_EMU_NO_FP_TRAP)
#include <ucontext.h>
#include <xmmintrin.h>
#define CUDA_EMU_FP_TRAP 1
#endif

namespace emu {

// "obj+0xOFF": a code address as addr2line takes it (the offset in its executable or library).
struct CodeAddress {
  char text[512];
};
inline CodeAddress code_address(const void* pc) {
  CodeAddress a;
  Dl_info info;
  if (pc != nullptr && dladdr(pc, &info) != 0 && info.dli_fname != nullptr)
    std::snprintf(a.text, sizeof(a.text), "%s+0x%lx (addr2line -i -e %s 0x%lx)", info.dli_fname,
                  static_cast<unsigned long>(reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase)),
                  info.dli_fname,
                  static_cast<unsigned long>(reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase)));
  else
    std::snprintf(a.text, sizeof(a.text), "%p", pc);
  return a;
}

// One report of a kind per launch (a broken rule is usually broken by every thread at once).
inline void report_once(std::atomic<bool>& reported, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
inline void report_once(std::atomic<bool>& reported, const char* fmt, ...) {
  report_protocol_error();
  if (reported.exchange(true)) return;
  std::va_list args;
  va_start(args, fmt);
  report_line(fmt, args);
  va_end(args);
}

// ---- the async proxy's view of the shared window ----
#ifdef CUDA_EMU_THREADS
constexpr bool kProxyTracked = false;  // OS threads run at once: a change cannot be attributed
#else
constexpr bool kProxyTracked = true;
#endif
constexpr uint32_t kUnfenced = 0xffffffffu;

struct ProxyView {
  unsigned char* base = nullptr;  // the window, while tracked
  size_t size = 0;
  std::vector<unsigned char> copy;  // the bytes as last attributed
  std::vector<int16_t> writer;      // the thread whose generic store wrote the byte, or -1
  std::vector<uint32_t> fenced_at;  // kUnfenced, or the writer's barrier count at its fence.proxy.async
  std::vector<uint32_t> serial;     // that fence's number (fences are numbered in the order they run)
  std::vector<std::vector<uint32_t>> unfenced = std::vector<std::vector<uint32_t>>(1024);  // per thread
  uint32_t fences = 0;              // fences so far in the block
  std::vector<uint32_t> last_fence = std::vector<uint32_t>(1024);  // per thread: its latest fence's number
  std::vector<uint32_t> waited = std::vector<uint32_t>(1024);  // per thread: the latest fence an mbarrier ordered
};

inline void proxy_reset(ProxyView& v) {
  v.base = nullptr;
  v.size = 0;
  for (auto& u : v.unfenced) u.clear();
  v.fences = 0;
  std::fill(v.last_fence.begin(), v.last_fence.end(), 0u);
  std::fill(v.waited.begin(), v.waited.end(), 0u);
}
inline void proxy_begin(ProxyView& v, unsigned char* base, size_t size) {
  if (!kProxyTracked || v.base == base) return;
  proxy_reset(v);
  v.base = base;
  v.size = size;
  v.copy.assign(base, base + size);
  v.writer.assign(size, -1);
  v.fenced_at.assign(size, kUnfenced);
  v.serial.assign(size, 0);
}
// Bytes the emulation itself wrote on the async proxy's side (a TMA copy): not generic writes.
inline void proxy_async_wrote(ProxyView& v, const unsigned char* p, size_t n) {
  if (v.base == nullptr || p < v.base || p >= v.base + v.size) return;
  const size_t off = size_t(p - v.base), end = off + n < v.size ? off + n : v.size;
  std::memcpy(&v.copy[off], p, end - off);
  std::fill(v.writer.begin() + long(off), v.writer.begin() + long(end), int16_t(-1));
}
// Thread t ran: the bytes that changed since the copy are its generic stores.
inline void proxy_attribute(ProxyView& v, unsigned t) {
  if (v.base == nullptr) return;
  const unsigned char* now = v.base;
  unsigned char* was = v.copy.data();
  // (pages first: most switches change nothing, and memcmp over 4 KiB is a few hundred ns)
  for (size_t page = 0; page < v.size; page += 4096) {
    const size_t page_end = v.size - page < 4096 ? v.size : page + 4096;
    if (std::memcmp(now + page, was + page, page_end - page) == 0) continue;
    for (size_t off = page; off < page_end; off += 64) {
      const size_t n = page_end - off < 64 ? page_end - off : 64;
      if (std::memcmp(now + off, was + off, n) == 0) continue;
      for (size_t j = off; j < off + n; ++j) {
        if (now[j] == was[j]) continue;
        was[j] = now[j];
        if (v.writer[j] != int16_t(t) || v.fenced_at[j] != kUnfenced) v.unfenced[t].push_back(uint32_t(j));
        v.writer[j] = int16_t(t);
        v.fenced_at[j] = kUnfenced;
      }
    }
  }
}
// fence.proxy.async by thread t, which has passed `syncs` block-wide barriers.
inline void proxy_fence(ProxyView& v, unsigned t, unsigned syncs) {
  if (v.base == nullptr) return;
  proxy_attribute(v, t);
  v.last_fence[t] = ++v.fences;
  for (uint32_t j : v.unfenced[t])
    if (v.writer[j] == int16_t(t) && v.fenced_at[j] == kUnfenced) v.fenced_at[j] = syncs, v.serial[j] = v.fences;
  v.unfenced[t].clear();
}
// The async proxy reads bytes [off, off + n) for thread t (`syncs` barriers passed): nullptr, or
// what is wrong, with the writer in `who`. A fence needs a barrier after it before the read, unless
// the writer is in the reading warpgroup (wgmma is issued by the warpgroup together).
inline const char* proxy_unseen(const ProxyView& v, uint32_t off, unsigned n, unsigned t, unsigned syncs, int& who) {
  for (uint32_t j = off; j < off + n && j < v.size; ++j) {
    const int w = v.writer[j];
    if (w < 0) continue;
    who = w;
    if (v.fenced_at[j] == kUnfenced) return "with no fence.proxy.async since";
    if (!(syncs > v.fenced_at[j]) && unsigned(w) / 128 != t / 128 && v.waited[t] < v.serial[j])
      return "and fenced (fence.proxy.async), but no __syncthreads or mbarrier after that fence ordered it before "
             "this read";
  }
  return nullptr;
}

// ---- the accumulators in flight: the floating-point trap ----
inline std::atomic<bool> fp_trap_reported{false};
#ifdef CUDA_EMU_FP_TRAP
// On: the "invalid" exception unmasked (its sticky flag cleared first); off: masked, as by default.
inline void fp_trap(bool on) {
  const unsigned csr = _mm_getcsr() & ~unsigned(_MM_EXCEPT_INVALID);
  _mm_setcsr(on ? csr & ~unsigned(_MM_MASK_INVALID) : csr | _MM_MASK_INVALID);
}
inline struct sigaction fp_trap_previous;
inline CUDA_EMU_PER_THREAD bool fp_trap_armed = false;  // this (emulated) thread has wgmma's in flight
// A signalling NaN reached an arithmetic instruction while the thread's accumulators were in
// flight: report it, mask the exception in the interrupted context (the instruction then
// completes with a quiet NaN) and fail the launch.
inline void fp_trap_signal(int sig, siginfo_t* info, void* context) {
  if (sig != SIGFPE || info->si_code != FPE_FLTINV || !fp_trap_armed) {
    sigaction(SIGFPE, &fp_trap_previous, nullptr);  // not ours: the instruction faults again, as before
    return;
  }
  auto* uc = static_cast<ucontext_t*>(context);
  uc->uc_mcontext.fpregs->mxcsr = (uc->uc_mcontext.fpregs->mxcsr | _MM_MASK_INVALID) & ~unsigned(_MM_EXCEPT_INVALID);
  report_protocol_error();
  if (fp_trap_reported.exchange(true)) return;
  char line[900];
  const int n = std::snprintf(line, sizeof(line),
                              "cuda_emu: thread %u read wgmma accumulator registers while the wgmma was in flight (before "
                              "the wgmma.wait_group that completes it): a floating-point instruction took their poison "
                              "NaN at %s\n", thread_index(), code_address(info->si_addr).text);
  if (n > 0) (void)!write(2, line, size_t(n) < sizeof(line) ? size_t(n) : sizeof(line) - 1);
}
inline void fp_trap_install() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction a {};
    a.sa_sigaction = fp_trap_signal;
    a.sa_flags = SA_SIGINFO;
    sigemptyset(&a.sa_mask);
    sigaction(SIGFPE, &a, &fp_trap_previous);
  });
}
inline void fp_trap_arm(bool on) {
  fp_trap_armed = on;
  fp_trap(on);
}
#else
inline void fp_trap_install() {}
inline void fp_trap_arm(bool) {}
#endif

// ---- setmaxnreg's pool ----
struct RegisterGroup {
  unsigned regs = 0;                // registers a thread now
  unsigned requests = 0, granted = 0;  // the warpgroup's setmaxnreg's issued, and completed
  unsigned want = 0;                // the count asked for by the latest request
  std::vector<unsigned> waiting;    // fibers
};
struct RegisterPool {
  unsigned launch = 0;  // registers a thread at launch (0: the kernel does not declare them)
  unsigned threads = 0;
  int64_t free = 0;     // the block's registers no warpgroup holds
  std::vector<RegisterGroup> groups;
  std::vector<unsigned> calls = std::vector<unsigned>(1024);  // per thread: its setmaxnreg's
  std::condition_variable changed;  // OS threads
};
inline void pool_reset(RegisterPool& p, unsigned launch, unsigned threads) {
  p.launch = launch;
  p.threads = threads;
  p.free = 0;
  p.groups.assign(threads / 128, RegisterGroup{});
  for (RegisterGroup& g : p.groups) g.regs = launch;
  std::fill(p.calls.begin(), p.calls.end(), 0u);
}
// Grant every request the pool can meet (a decrease always), in warpgroup order, until none
// more can be: returns true if any was (the caller wakes the waiters).
inline bool pool_grant(RegisterPool& p) {
  bool any = false;
  for (bool more = true; more;) {
    more = false;
    for (RegisterGroup& g : p.groups) {
      if (g.granted == g.requests) continue;
      const int64_t need = (int64_t(g.want) - int64_t(g.regs)) * 128;
      if (need > p.free) continue;
      p.free -= need;
      g.regs = g.want;
      g.granted = g.requests;
      more = any = true;
    }
  }
  return any;
}
// The warpgroups and their counts, for a report: "warpgroup 0 at 40, warpgroup 1 at 240, ...".
inline std::string pool_counts(const RegisterPool& p) {
  std::string s;
  for (size_t w = 0; w < p.groups.size(); ++w)
    s += (w ? ", warpgroup " : "warpgroup ") + std::to_string(w) + " at " + std::to_string(p.groups[w].regs);
  return s;
}
inline void pool_report_wait(const RegisterPool& p, size_t w, size_t threads) {
  const RegisterGroup& g = p.groups[w];
  std::fprintf(stderr, "cuda_emu: %zu thread(s) of warpgroup %zu wait at setmaxnreg.inc to %u registers a thread: it "
               "needs %lld more, and the block's pool has %lld free of the %u x %u = %lld it launched with (%s "
               "registers a thread): an increase the pool cannot meet hangs on a GPU\n", threads, w, g.want,
               static_cast<long long>((int64_t(g.want) - g.regs) * 128), static_cast<long long>(p.free), p.launch,
               p.threads, static_cast<long long>(int64_t(p.launch) * p.threads), pool_counts(p).c_str());
}

}  // namespace emu
