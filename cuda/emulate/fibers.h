// Fibers: user-space threads for the CPU emulation (cuda/emulate/cuda_emu.h). Each fiber has a
// stack of its own; switching from one to another saves the registers a function call must
// preserve, swaps stack pointers and restores the other fiber's registers. No system call, no
// scheduler of the operating system: a switch costs nanoseconds where waking an OS thread at a
// barrier costs microseconds. Built as part of the emulation:
//   c++ -std=c++17 -O2 -pthread -shared -fPIC -fvisibility=hidden -Icuda cuda/emulate/emulate.cpp -o /tmp/libdense_emu.so
// On x86-64 the switch is the dozen instructions below; elsewhere (or with -DCUDA_EMU_UCONTEXT)
// it is POSIX swapcontext, which also saves the signal mask with a system call per switch.
// Under AddressSanitizer every switch is announced to it (__sanitizer_*_switch_fiber), so that
// it knows which stack is live.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#if !defined(__x86_64__) && !defined(CUDA_EMU_UCONTEXT)
#define CUDA_EMU_UCONTEXT 1
#endif
#ifdef CUDA_EMU_UCONTEXT
#include <ucontext.h>
#endif

// (The memory counters' build, CUDA_EMU_COUNT, borrows the sanitizer's instrumentation but not
// its run time: there is no shadow memory to tell about a switch.)
#if defined(CUDA_EMU_COUNT)
#elif defined(__SANITIZE_ADDRESS__)
#define CUDA_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDA_EMU_ASAN 1
#endif
#endif
#ifdef CUDA_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#ifndef CUDA_EMU_UCONTEXT
// void emu_fiber_switch(void** save_sp, void* load_sp): push the callee-saved registers of the
// System V x86-64 ABI, store the stack pointer in *save_sp, load load_sp, pop that fiber's
// registers and return into it. (The floating-point control registers are callee-saved too; the
// emulation never changes them, so every fiber shares the launching thread's and they are not
// swapped.) A local symbol: each program that includes this header has its own copy.
asm(R"(
  .text
  .p2align 4
  .local emu_fiber_switch
  .type emu_fiber_switch, @function
emu_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_fiber_switch, .-emu_fiber_switch
)");
extern "C" void emu_fiber_switch(void** save_sp, void* load_sp);
#endif

namespace emu {
namespace fiber {

struct Context {
#ifdef CUDA_EMU_UCONTEXT
  ucontext_t uc;
#else
  void* sp = nullptr;
#endif
  void (*fn)(void*) = nullptr;  // what the fiber runs when first switched to
  void* arg = nullptr;
  const void* stack_bottom = nullptr;  // for AddressSanitizer; learnt on the way for the launching thread
  size_t stack_size = 0;
};

// The fiber being entered and the one being left, for the code that runs right after a switch.
inline Context* entering = nullptr;
inline Context* leaving = nullptr;

inline void arrived() {
#ifdef CUDA_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &leaving->stack_bottom, &leaving->stack_size);
#endif
}

// Where a new fiber starts: run its function. The function never returns (it ends with exit_to).
[[noreturn]] inline void entry() {
  arrived();
  entering->fn(entering->arg);
  std::fprintf(stderr, "cuda_emu: a fiber returned instead of switching away\n");
  std::abort();
}

// A stack of `size` bytes with an inaccessible guard page below it: an overflow faults at once
// instead of overwriting a neighbour. Never freed: the emulation keeps its stacks for reuse.
inline void* new_stack(size_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED || mprotect(p, page, PROT_NONE) != 0) {
    std::fprintf(stderr, "cuda_emu: cannot map a fiber stack of %zu bytes\n", size);
    std::abort();
  }
  return static_cast<char*>(p) + page;
}

// Make `c` start fn(arg) on the given stack when it is next switched to.
inline void prepare(Context& c, void* stack, size_t size, void (*fn)(void*), void* arg) {
  c.fn = fn;
  c.arg = arg;
  c.stack_bottom = stack;
  c.stack_size = size;
#ifdef CUDA_EMU_ASAN
  // The fiber that last used this stack never returned from its frames, so AddressSanitizer's
  // marks for them (variables out of scope) are still there: clear them.
  __asan_unpoison_memory_region(stack, size);
#endif
#ifdef CUDA_EMU_UCONTEXT
  if (getcontext(&c.uc) != 0) std::abort();
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, reinterpret_cast<void (*)()>(&entry), 0);
#else
  // The top of the stack as emu_fiber_switch will pop it: six registers (zero), the address it
  // returns to (entry), and above that a return address for entry itself, which never returns.
  // After the `ret` the stack pointer is 8 off a 16-byte boundary, as at any function's entry.
  auto* top = reinterpret_cast<uintptr_t*>((reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15));
  top -= 8;
  for (int i = 0; i < 8; ++i) top[i] = 0;
  top[6] = reinterpret_cast<uintptr_t>(&entry);
  c.sp = top;
#endif
}

// Save the running fiber into `from` and continue `to`; returns when something switches back.
inline void switch_to(Context& from, Context& to) {
  leaving = &from;
  entering = &to;
#ifdef CUDA_EMU_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, to.stack_bottom, to.stack_size);
#endif
#ifdef CUDA_EMU_UCONTEXT
  swapcontext(&from.uc, &to.uc);
#else
  emu_fiber_switch(&from.sp, to.sp);
#endif
#ifdef CUDA_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, &leaving->stack_bottom, &leaving->stack_size);
#endif
}

// Leave a fiber that has finished, for good: its stack may be reused by the next prepare().
[[noreturn]] inline void exit_to(Context& self, Context& to) {
  leaving = &self;
  entering = &to;
#ifdef CUDA_EMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, to.stack_bottom, to.stack_size);
#endif
#ifdef CUDA_EMU_UCONTEXT
  setcontext(&to.uc);
#else
  void* discard;
  emu_fiber_switch(&discard, to.sp);
#endif
  std::abort();
}

}  // namespace fiber
}  // namespace emu
