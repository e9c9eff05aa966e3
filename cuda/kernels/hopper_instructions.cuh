// Hopper's asynchronous instructions (sm_90a), one wrapper each, as cuda/kernels/instructions.cuh
// has them for sm_80's: inline PTX on the GPU, the emulation's model on the CPU
// (cuda/emulate/hopper.h, which says what each does and how it is checked). Compiled for another
// GPU than sm_90a, the device side of these wrappers traps: a Hopper version refuses to launch
// there (cuda/kernels/launch.cuh), and version 0 does not choose it.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_v31.cu -o /tmp/v31.cubin
// Inline PTX has no loops: the wgmma wrappers' accumulator registers are lists the preprocessor
// writes once (DENSE_ACC_R, DENSE_D_R), one asm statement a (type, N).
#pragma once

#include "instructions.cuh"

#if defined(__CUDACC__)
#include <cuda.h>  // CUtensorMap (a type only: the driver library is not linked)
#define DENSE_GRID_CONSTANT __grid_constant__
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DENSE_HOPPER_ONLY(stmt) __trap()  // not sm_90a: the launcher never runs these kernels here
#else
#define DENSE_HOPPER_ONLY(stmt) stmt
#endif
#else
struct CUtensorMap {  // (128 opaque bytes; the GPU's is 64-byte aligned, which the emulation does not need)
  unsigned long long opaque[16];
};
#define DENSE_GRID_CONSTANT
#endif

namespace {

enum SmemSwizzle : int { kSwizzleNone = 0, kSwizzle128B = 1, kSwizzle64B = 2 };  // the matrix descriptor's bits 62-63

#if defined(__CUDACC__)
// The shared window: on a GPU every shared address is already in it; the emulation needs the arena.
__device__ __forceinline__ void shared_window(void*) {}
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void fence_proxy_async() { DENSE_HOPPER_ONLY(asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory")); }
__device__ __forceinline__ void fence_barrier_init() {
  DENSE_HOPPER_ONLY(asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"));
}
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, unsigned count) {
  DENSE_HOPPER_ONLY(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)));
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  DENSE_HOPPER_ONLY(asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory"));
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  DENSE_HOPPER_ONLY(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
                                 "r"(bytes) : "memory"));
}
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, unsigned parity) {
  uint32_t done = 0;
  DENSE_HOPPER_ONLY(asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.b32 %0, 1, 0, p;\n}\n"
      : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory"));
  return done != 0;
}
// TMA: the box of `map` at coordinates (c0, c1) (c0 along the contiguous dimension) into `dst`;
// its bytes complete `bar`'s transaction count when they land.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  DENSE_HOPPER_ONLY(asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar)) : "memory"));
}
template <unsigned Regs>
__device__ __forceinline__ void setmaxnreg_inc() { DENSE_HOPPER_ONLY(asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs))); }
template <unsigned Regs>
__device__ __forceinline__ void setmaxnreg_dec() { DENSE_HOPPER_ONLY(asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs))); }

__device__ __forceinline__ void wgmma_fence() { DENSE_HOPPER_ONLY(asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory")); }
__device__ __forceinline__ void wgmma_commit() { DENSE_HOPPER_ONLY(asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory")); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  DENSE_HOPPER_ONLY(asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"));
}

// wgmma's accumulator operands, written once. The instruction names D's R = N/2 registers %0 to
// %R-1 (the asm's outputs come first), 16 to a line; DENSE_D_R binds them to d[0] ... d[R-1].
#define DENSE_ACC_0 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
#define DENSE_ACC_1 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define DENSE_ACC_2 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"
#define DENSE_ACC_3 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define DENSE_ACC_4 "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79"
#define DENSE_ACC_5 "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"
#define DENSE_ACC_6 "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111"
#define DENSE_ACC_7 "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define DENSE_ACC_16 DENSE_ACC_0
#define DENSE_ACC_64 DENSE_ACC_0 "," DENSE_ACC_1 "," DENSE_ACC_2 "," DENSE_ACC_3
#define DENSE_ACC_128 DENSE_ACC_64 "," DENSE_ACC_4 "," DENSE_ACC_5 "," DENSE_ACC_6 "," DENSE_ACC_7
#define DENSE_D8(i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define DENSE_D16(i) DENSE_D8(i), DENSE_D8(i + 8)
#define DENSE_D_16 DENSE_D16(0)
#define DENSE_D_64 DENSE_D16(0), DENSE_D16(16), DENSE_D16(32), DENSE_D16(48)
#define DENSE_D_128 DENSE_D_64, DENSE_D16(64), DENSE_D16(80), DENSE_D16(96), DENSE_D16(112)
// One wgmma on R accumulators: INSTR is the instruction's shape and types; the operands after D
// are numbered from R on (nvcc's inline PTX has no symbolic names): desc_a %R, desc_b %R+1, scale_d
// %R+2 (made the predicate p), then, for 16-bit types, TransA %R+3 and TransB %R+4.
#define DENSE_WGMMA(INSTR, R, A, B, SCALE, TRANS, ...)                                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SCALE ", 0;\nwgmma.mma_async.sync.aligned." INSTR " {" \
               DENSE_ACC_##R "}, %" #A ", %" #B ", p, 1, 1" TRANS ";\n}\n"                                  \
               : DENSE_D_##R : __VA_ARGS__)
// wgmma.mma_async.sync.aligned.m64n{N}k16.f32.{bf16,f16}: D (64×N, N/2 float registers a thread)
// += A (64×16) · B (16×N), both in shared memory, named by descriptors; TransA/TransB: the operand
// is MN-major (its M or N dimension contiguous) instead of K-major. scale_d = 0: D = A·B.
#define DENSE_WGMMA_16BIT(N, TYPES, R, A, B, SCALE, TA, TB)                                                 \
  DENSE_WGMMA("m64n" #N "k16.f32." TYPES, R, A, B, SCALE, ", %" #TA ", %" #TB, "l"(desc_a), "l"(desc_b), \
              "r"(scale_d), "n"(TransA), "n"(TransB))
template <int N, typename T, int TransA, int TransB>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  constexpr bool bf16 = MmaType<T>::bf16;
  static_assert(N == 32 || N == 128 || N == 256, "the wrappers cover N = 32, 128 and 256");
  if constexpr (N == 32 && bf16) DENSE_WGMMA_16BIT(32, "bf16.bf16", 16, 16, 17, 18, 19, 20);
  else if constexpr (N == 32) DENSE_WGMMA_16BIT(32, "f16.f16", 16, 16, 17, 18, 19, 20);
  else if constexpr (N == 128 && bf16) DENSE_WGMMA_16BIT(128, "bf16.bf16", 64, 64, 65, 66, 67, 68);
  else if constexpr (N == 128) DENSE_WGMMA_16BIT(128, "f16.f16", 64, 64, 65, 66, 67, 68);
  else if constexpr (bf16) DENSE_WGMMA_16BIT(256, "bf16.bf16", 128, 128, 129, 130, 131, 132);
  else DENSE_WGMMA_16BIT(256, "f16.f16", 128, 128, 129, 130, 131, 132);
#endif
}
// wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32: tf32 operands (the low 13 bits of each
// float ignored), both K-major (tf32 has no transpose).
__device__ __forceinline__ void wgmma_m64n128k8_tf32(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  DENSE_WGMMA("m64n128k8.f32.tf32.tf32", 64, 64, 65, 66, "", "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}
#else
// The arena's size tells the emulation which bytes to watch for generic writes the async proxy
// reads (cuda/emulate/hopper_checks.h): a static array's, or the launch's dynamic shared memory.
inline void shared_window(void* arena) {
  emu::shared_window(arena, arena == emu::dynamic_shared() ? emu::current_block->dynamic_bytes : 0);
}
template <size_t N>
inline void shared_window(unsigned char (&arena)[N]) { emu::shared_window(arena, N); }
inline uint32_t smem_addr(const void* p) { return emu::window_offset(p); }
inline void fence_proxy_async() { emu::fence_proxy_async(); }
inline void fence_barrier_init() { emu::fence_mbarrier_init(); }
inline void mbarrier_init(uint64_t* bar, unsigned count) { emu::mbarrier_init(bar, count); }
inline void mbarrier_arrive(uint64_t* bar) { emu::mbarrier_arrive(bar); }
inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) { emu::mbarrier_arrive(bar, bytes); }
inline bool mbarrier_try_wait_parity(uint64_t* bar, unsigned parity) { return emu::mbarrier_try_wait_parity(bar, parity); }
inline void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  emu::tma_load_2d(dst, map, c0, c1, bar);
}
template <unsigned Regs>
inline void setmaxnreg_inc() { emu::setmaxnreg(Regs, true); }
template <unsigned Regs>
inline void setmaxnreg_dec() { emu::setmaxnreg(Regs, false); }
inline void wgmma_fence() { emu::wgmma_fence(); }
inline void wgmma_commit() { emu::wgmma_commit(); }
template <int N>
inline void wgmma_wait() { emu::wgmma_wait(N); }
template <int N, typename T, int TransA, int TransB>
inline void wgmma_m64k16(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  emu::wgmma_issue(d, N, desc_a, desc_b, scale_d != 0, TransA != 0, TransB != 0, MmaType<T>::bf16, false);
}
inline void wgmma_m64n128k8_tf32(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  emu::wgmma_issue(d, 128, desc_a, desc_b, scale_d != 0, false, false, false, true);
}
#endif

// A matrix descriptor for a shared-memory operand at `tile`: LBO and SBO in bytes (PTX ISA,
// "Matrix Descriptor Format": address, LBO and SBO in units of 16 bytes, the swizzle in bits 62-63).
__device__ __forceinline__ uint64_t smem_desc(const void* tile, uint32_t lbo, uint32_t sbo, int swizzle) {
  return uint64_t((smem_addr(tile) & 0x3ffffu) >> 4) | (uint64_t((lbo & 0x3ffffu) >> 4) << 16) |
         (uint64_t((sbo & 0x3ffffu) >> 4) << 32) | (uint64_t(swizzle) << 62);
}
// Wait until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

}  // namespace

// Dynamic shared memory (kernel<<<grid, block, bytes>>>): more than a block may declare statically
// (48 KiB). Its start is rounded up to 1024 bytes here, the swizzles' period; the launcher asks
// for 1024 bytes more than the kernel uses.
#if defined(__CUDACC__)
#define DENSE_DYNAMIC_SMEM(name)                     \
  extern __shared__ __align__(16) unsigned char name##_raw[]; \
  unsigned char* const name = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(name##_raw) + 1023) & ~uintptr_t(1023))
#else
#define DENSE_DYNAMIC_SMEM(name) unsigned char* const name = emu::dynamic_shared()
#endif
